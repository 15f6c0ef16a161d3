"""`sdperf run`: what the run will do, checked before anything runs (`plan`), the notebooks executed by papermill and
each one's outputs promoted only when it completes (`runner`), the stand-alone comparisons measured up front in one
schedule (`prefetch`), and the run's expected time from each part's last timed run (`eta`).

May import: report/ and everything below it. Nothing but the command line (sdperf.cli) imports run/.
"""
