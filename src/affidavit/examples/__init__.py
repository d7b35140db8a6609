"""Example agents, runnable with `affidavit run PLAN --tools affidavit.examples.<name>`."""
