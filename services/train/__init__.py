"""The train service: trains one LoRA adapter per capability with GRPO (a work-queue worker)."""
