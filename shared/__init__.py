"""retrace's common library: contracts, configuration, bus, store and the service runtime."""
