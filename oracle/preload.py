"""What the workers' fork server imports once, so that no worker imports it again (`oracle.sandbox`).

A worker's first call under a dispatch mode (the profiled call, `oracle.harness`) imports torch's dynamo
machinery: about 815 modules, 1 s of CPU from bytecode and 3.4 s from source (where the Python files have
no bytecode beside them and none may be written, as on a GPU machine whose torch was installed without it).
Imported here, in the fork server, every worker starts with it (on an H100's host, a worker's start took
5.4 s of CPU without it: benchmarks/fork_preload.py). Nothing here may touch CUDA: a worker forked from a
process that asked torch about the device cannot use it ("Cannot re-initialize CUDA in forked
subprocess"; `tests/test_oracle_gpu.py` checks that a worker can). `torch.utils.cpp_extension` is not
here for that reason: on a GPU machine its import asks `torch.cuda.is_available()`.

An import that fails is skipped: the worker then imports the module itself, as it would without this.
"""

import importlib

MODULES = ("torch._dynamo",)

for _name in MODULES:
    try:
        importlib.import_module(_name)
    except Exception:  # noqa: BLE001 - a worker imports it itself, and meets the same error where it matters
        pass
