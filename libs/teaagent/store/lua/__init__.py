"""The Lua scripts of ``teaagent.store``, one atomic step per file (a package so they ship as data)."""
