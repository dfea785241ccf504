"""Run profiles (`profiles/`) and the probes behind the project's decisions (`probes/`)."""
