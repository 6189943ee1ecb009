"""Tests of softfree_mm/engine/ through the tools: errors, bad inputs, device, memory, kill and resume."""
