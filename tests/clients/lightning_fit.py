"""PyTorch Lightning's fit as users run it: bf16-mixed autocast, gradient clipping,
accumulate_grad_batches=2 (a step every second batch, inside optimizer.step(closure)), a
validation loop each epoch (under inference_mode), a StepLR schedule and ModelCheckpoint
saving every epoch. Writes the losses, the validation losses and, reloaded after fit, what
every checkpoint holds (float.hex). It never imports teraio."""

import argparse
import json
import logging
import os
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

F = torch.nn.functional


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                                       torch.nn.GELU(), torch.nn.Linear(256, 8))

    def training_step(self, batch, _):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, _):
        self.log("val_loss", F.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-3)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 3)}


class Record(Callback):
    def __init__(self):
        self.losses, self.val = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, index):
        self.losses.append(outputs["loss"].item().hex())

    def on_validation_epoch_end(self, trainer, module):
        self.val.append(trainer.callback_metrics["val_loss"].item().hex())


def hexes(obj):
    if isinstance(obj, torch.Tensor):
        return [v.hex() for v in obj.float().flatten().tolist()]
    if isinstance(obj, dict):
        return {str(k): hexes(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [hexes(v) for v in obj]
    return repr(obj)


def data(generator, count: int):
    return torch.utils.data.TensorDataset(torch.randn(count, 64, generator=generator),
                                          torch.randint(0, 8, (count,), generator=generator))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="lightning_fit.json")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    L.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(1)
    train, val = data(generator, 64), data(generator, 16)
    record = Record()
    folder = args.out + ".ckpt"   # the profile, the planned run and the plain run share a folder
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=args.epochs, precision="bf16-mixed",
                        gradient_clip_val=0.5, accumulate_grad_batches=2, logger=False, deterministic=True,
                        callbacks=[ModelCheckpoint(dirpath=folder, every_n_epochs=1, save_top_k=-1), record],
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Net(), torch.utils.data.DataLoader(train, batch_size=8, shuffle=True),
                torch.utils.data.DataLoader(val, batch_size=8))
    saved = {}
    for name in sorted(os.listdir(folder)):
        checkpoint = torch.load(os.path.join(folder, name), weights_only=False)
        saved[name] = hexes({key: checkpoint[key] for key in ("state_dict", "optimizer_states", "global_step")})
    with open(args.out, "w") as f:
        json.dump({"losses": record.losses, "val": record.val, "saved": saved}, f)


if __name__ == "__main__":
    main()
