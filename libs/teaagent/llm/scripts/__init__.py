"""Scripts for the offline ``scripted`` provider that ship with teaagent (JSON files, package data)."""
