"""Controller: policies (pure cores), plan arithmetic, executor and service shell."""
