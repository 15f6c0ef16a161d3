"""`sdperf run`: what the run will do, checked before anything runs (`plan`: notebooks, their parameters, the profile's
sections), the notebooks executed by papermill, each skipped when already run for the same clean commit, its
outputs promoted only when it completes (`runner`), with the run's stand-alone comparisons measured up front in
one schedule (`prefetch`), and the run's expected time from each part's last timed run (`eta`).

May import: report/ and everything below it. Nothing but the command line (sdperf.cli) imports run/.
"""
