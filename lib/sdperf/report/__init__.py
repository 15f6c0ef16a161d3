"""The report a reader opens: reports/<profile>/index.html built from results.csv and the captioned figures
(`report`), each notebook's finding in a sentence (`findings`), the published-vs-measured table
(`published_vs_measured`), how a number and its range are written (`numbers`), the README's answer table (`answer`),
and the page checked in a headless browser (`report_check`).

May import: select/, measure/, model/, config/, store/, core/. Never run/: the page is rebuilt from what is on disk.
"""
