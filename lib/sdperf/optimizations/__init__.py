"""One module per optimization step, each with the same shape: `availability(...)` says whether it can run
on this device and why not, `apply(pipe, ...)` returns the optimized pipeline."""
