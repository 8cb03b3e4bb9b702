"""Adapters that let other training libraries use sdar's environments (`sdar.integrations.trl`: TRL's
`GRPOTrainer`). Each lives behind its own optional extra and is imported on its own."""
