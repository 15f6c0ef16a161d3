"""The judge of every lossy technique, on the study's reference model (`sdperf.refmodel`).

`converged` (the converged fp32 solve every verdict is judged against), `paired` (paired measures and the budget),
`controls` (the twin and known harms each run carries), `techniques` (each key judged alone and stacked),
`technique_setup` (how a judged key renders), `renders` (those renders, cached), `technique_report` (12's table
and figure), `transfer` (what may carry over to SD 1.5), `guidance_curve` (NeMo's protocol on this model).
"""
