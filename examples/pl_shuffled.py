"""``examples/lightning_shuffled.py`` with the classic package, ``import pytorch_lightning``:
gandiva's callback reaches it through ``pytorch_lightning``'s own entry point."""

import pytorch_lightning as pl
from lightning_shuffled import main

if __name__ == "__main__":
    main(pl)
