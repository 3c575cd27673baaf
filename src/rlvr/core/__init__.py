"""The foundation every role stands on: devices and placement (`devices`), loading models and tokenizers
(`models`), checkpoints and run directories' files (`checkpoint`), metrics files (`tracking`).

May import: nothing else of rlvr (only other modules of this package).
"""
