# Raised at every release that lands (0.1.0 was every release up to stop 66's):
# each checkpoint records it, so a refusal after an upgrade names the upgrade.
__version__ = "0.2.0"
