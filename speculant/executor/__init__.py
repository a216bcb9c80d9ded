"""Model running and loading: builds runners from checkpoints and runs every model forward."""
