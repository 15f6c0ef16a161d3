"""Repository upkeep, not the study: the pinned requirement locks read as data (`locks`), whether every pin of a
lock has a wheel that installs (`lock_check`), the notebooks stored without outputs (`notebook_hygiene`),
and the lock installed with uv from where pip's configuration points (`fast_install`, run by make before sdperf exists).

May import: store/, core/. Nothing but the command line and the tests imports tooling/.
"""
