"""The app layer: the `teraio` command (cli, commands), the demo and the bootstrap that starts
a stage's agent inside the job. It sits above the three stages and imports them; nothing below
it (the base package `teraio`, teraio_profile, teraio_plan, teraio_run) imports it."""
