"""A CS336 assignment 1 solution written for the bridge's tests (nn.Module classes, as students write them)."""
