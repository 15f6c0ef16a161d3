"""One module per notebook: what it calls, and the state its cells hand on; nothing but the notebooks imports them.

00 baseline, 01 half_precision, 02 inference_mode, 03 attention, 04 torch_compile, 05 cuda_graphs, 06 deepspeed,
07 engine_export, 08 quantization, 09 fewer_steps and deployed (its students, tiny decoder and guidance cuts),
10 ladder and recipe (its second half: the stack search),
11 training_scaling, 12 fid_clip, 13 serving; `common` holds what several of them share.

May import: everything below it (run/ excepted: a notebook runs inside `sdperf run`, it does not drive it).
"""
