"""One module per subcommand; each exports `command`, a click command."""
