"""A job's record as server and worker share it: the state machine, its one transition function
and the project lock."""
