"""`make demo`: the sample catalog, its live workload, the screen and the final check."""
