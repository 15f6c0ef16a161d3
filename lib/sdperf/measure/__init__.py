"""The measuring method, the one way every number of the study is taken.

Every speed ratio comes from fresh processes in rounds (`rounds`: each configuration a `worker` forked from a server
that built nothing, or from one started under its allocator setting, `allocator_servers`; `lifeline` and
`forkserver_lifeline` make workers die with their launcher), shared by every comparison of a run (`ledger`), against
an fp32 baseline interpolated around each round, with an fp32 twin for the noise floor (`comparison`). Below them:
stage timing (`timing`), FLOPs and the measured matmul roof (`roofline`), output drift from the fp32 image
(`drift`), in-process measurements (`measurements`), the memory estimate that refuses what cannot fit (`memory`),
the half-precision budget rule (`half_budget`), what other processes took of the CPUs while a worker was timed
(`contention`), every rung's verdict before a run (`doctor`), and the notebook's handle on all of it (`study`).

May import: model/, config/, store/, core/, and the techniques (sdperf.optimizations).
"""
