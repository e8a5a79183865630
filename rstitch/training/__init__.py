"""Training and calibration jobs, above the methods they train for (a layer beside the runner):
R-Stitch+'s router with DAPO (dapo.py, fit_rstitch_router.py), the Arbitrage router
(fit_arbitrage_router.py), the testbed's model family (testbed_family.py), EASD's entropy
threshold (easd_calibration.py). scripts/ parse arguments and call them."""
