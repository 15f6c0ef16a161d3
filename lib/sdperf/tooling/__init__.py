"""Repository upkeep, not the study: the pinned requirement locks read as data (`locks`), whether every pin of a
lock has a wheel that installs (`lock_check`), and the notebooks stored without outputs (`notebook_hygiene`).

May import: store/, core/. Nothing but the command line and the tests imports tooling/.
"""
