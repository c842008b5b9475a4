"""Runs of other evaluation tools (lm-evaluation-harness, promptfoo) read into one typed
record, paired item by item and compared as a suite compares its two lanes: which
items' outputs differ, which grades flipped, and McNemar's test on the paired grades.
"""
