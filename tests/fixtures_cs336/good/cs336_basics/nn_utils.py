"""Loss and data loading."""

import numpy as np
import torch


def cross_entropy(inputs, targets):
    shifted = inputs - inputs.amax(dim=-1, keepdim=True)
    log_z = torch.log(torch.exp(shifted).sum(dim=-1))
    picked = shifted.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (log_z - picked).mean()


def get_batch(dataset, batch_size, context_length, device):
    starts = np.random.randint(0, len(dataset) - context_length, size=batch_size)
    x = np.stack([dataset[s : s + context_length] for s in starts])
    y = np.stack([dataset[s + 1 : s + 1 + context_length] for s in starts])
    return torch.as_tensor(x, dtype=torch.long, device=device), torch.as_tensor(y, dtype=torch.long, device=device)
