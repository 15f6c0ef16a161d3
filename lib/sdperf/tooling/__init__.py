"""Repository upkeep, not the study: the pinned locks read as data (`locks`), whether every pin has a wheel that
installs (`lock_check`), notebooks stored without outputs (`notebook_hygiene`), and the uv install (`fast_install`).

May import: store/, core/. Nothing but the command line and the tests imports tooling/.
"""
