"""What tests share: builders, clients and readers no module under src/ needs."""
