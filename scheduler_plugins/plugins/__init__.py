"""One scheduling plugin per module; ``scheduler_plugins.table`` lists them."""
