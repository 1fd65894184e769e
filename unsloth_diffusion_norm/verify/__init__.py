"""The proof room: everything that shows the core (the package's top-level modules) is right, and nothing
that runs inside a user's training step. The core never imports from here.

- `oracle`: the independent reference (never imports the patches or the loss code it judges);
- `tiny_model`: a Nemotron-Labs-Diffusion-shaped remote-code checkpoint we write ourselves;
- `fixtures`: examples, the tiny checkpoint, the model loader, the CPU environment of our own runs;
- `experiment`: real `Trainer.train()` runs, recorded window by window;
- `judging`: a recorded window against the oracle;
- `instruments`: counters and clocks attached to a live trainer (collectives, step time);
- `scenarios`, `dp_cases`, `ranks`, `launch`, `sharded`: what is run, in one process or many;
- `reproduce`, `doctor`, `bench`, `cli`: the user-facing proof; `tables`: every markdown table.
"""
