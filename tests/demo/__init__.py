"""Tests of the demo (make demo): its data, configs, training, determinism and the main job."""
