"""The rollout service: runs agents on environments and stores every trajectory."""
