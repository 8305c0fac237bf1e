"""A sweep: plans and locks, the job sent to agents, dispatch and following, the decode
boundary for what nodes send, and nightly schedules."""
