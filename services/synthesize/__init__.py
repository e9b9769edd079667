"""The synthesize service: builds and calibrates one training environment per capability."""
