"""GPU time, recorded: the usage database the hub and the service share."""
