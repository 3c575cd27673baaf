"""What runs inside a sandbox: the judge and the program, two processes joined by two pipes (`harness`).

Standard library only (pytest too, for pytest-style test files), relative imports only: this directory is bound
read-only into each sandbox as the package `inside`, beside the few packages a sandbox gets (pytest and its
dependencies, numpy where the grader has it: `rlvr.sandbox.launch`). `rlvr.sandbox` imports `codec` and `wire`
from here to read the values a check sends back.

May import: nothing of rlvr outside this package.
"""
