"""Kinds of the simulator's events (a step's arrival is handled inline by the tool
end that causes it). Items are (time, seq, kind, a, b); seq breaks ties in push order."""

TOOL_END, WORKER, LOADED, PIN_EXPIRE, PREFETCH, TASK_START, SAMPLE, STEAL, MOVED = range(9)
