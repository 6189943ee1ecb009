"""Tests of tools/: the research and benchmark CLIs, distributed runs, set-up, GPU check, mim."""
