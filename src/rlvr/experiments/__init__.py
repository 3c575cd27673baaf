"""Experiments over runs: sweeps of seeds x configs (`sweep`), reading runs back and their statistics
(`runs`), figures (`plots`), the HTML report (`report`), and `rlvr demo` (`demo`).

May import: every package below it (rlvr.core ... rlvr.training).
"""
