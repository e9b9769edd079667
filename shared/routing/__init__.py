"""Routing: which adapter a task goes to. The router service routes live conversations with
it, the evaluator routes test tasks with it (so the routed set is measured as served)."""
