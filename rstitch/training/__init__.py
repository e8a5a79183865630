"""Training and calibration jobs (routers, the testbed family, EASD's threshold), above the methods
they train for, beside the runner; scripts/ parse arguments and call them."""
