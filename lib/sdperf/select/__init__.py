"""Choosing from measured rows: each technique's stand-alone rows found by catalog key (`standalone`), the search
over compatible stacks under the quality budget and its Pareto front (`stack_search`), and which engine and batch
sizes 07's sweep times (`engine_sweep`); the names of 10's rows that the report looks up (`scenarios`).

May import: measure/, model/, config/, store/, core/, and the techniques and the reference model's judgements.
"""
