"""Strategies: how prompts are made and how a verdict feeds the next round."""
