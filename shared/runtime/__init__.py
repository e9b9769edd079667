"""The service runtime every retrace service runs on: bus, store, HTTP, signals."""
