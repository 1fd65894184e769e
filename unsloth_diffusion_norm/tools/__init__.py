"""The tools room: what a user runs. The command line (`cli`, `python -m unsloth_diffusion_norm`) and its
commands: `doctor` (with `own_model` for `--model DIR`), `reproduce`, `bench`, `impact` (with
`docstring_data`, the data set it is shown on). Tools import the proof and the core; neither imports them.
"""
