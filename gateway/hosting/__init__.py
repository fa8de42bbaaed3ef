"""hosting: the sessions this replica serves (journal, lease and fencing, engine
requests) and the takeover of a session from another replica."""
