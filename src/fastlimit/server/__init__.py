"""The fastlimit server: settings, command table, event-loop layer, CLI."""
