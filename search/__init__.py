"""Search: generators, the controller, the run store, statistics, the live report and the CLI."""
