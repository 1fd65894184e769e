"""The proof room: everything that shows the core (the package's top-level modules) is right. It imports
the core and never the tools; the core imports neither.

- `oracle`: the independent reference (never imports the patches or the loss code it judges);
- `tiny_model`: a Nemotron-Labs-Diffusion-shaped remote-code checkpoint we write ourselves;
- `fixtures`: examples, the tiny checkpoint, the model loader, the CPU environment of our own runs;
- `experiment`: real `Trainer.train()` runs, recorded window by window;
- `judging`: a recorded window against the oracle;
- `instruments`: counters and clocks attached to a live trainer (collectives, step time);
- `scenarios`: realistic configurations in one process;
- `dp_cases`, `ranks`, `processes`, `engines`, `data_parallel`, `sharded`: the launched ranks;
- `tables`: every markdown table.
"""
