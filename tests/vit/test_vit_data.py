"""Image data: the fixed digits split and the image-folder loader (augmentation and errors)."""

import numpy as np
import pytest
from PIL import Image

from dca_theory.vit.data import ImageFolder, load_digits


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def test_digits_split_is_fixed_stratified_and_standardised(digits):
    train, test = digits
    assert (len(train), len(test)) == (1437, 360)  # 1,797 images, 20% test
    assert train.images.shape == (1437, 8, 8, 1) and train.images.dtype == np.float32
    # Stratified: every class has 20% +- 1 image of its examples in the test set.
    counts_tr, counts_te = np.bincount(train.labels), np.bincount(test.labels)
    frac = counts_te / (counts_tr + counts_te)
    assert np.all(np.abs(frac - 0.2) <= 1.0 / (counts_tr + counts_te))
    # Standardised with training statistics (exactly mean 0 / std 1 up to float32 rounding).
    assert abs(float(train.images.mean())) < 1e-5 and abs(float(train.images.std()) - 1) < 1e-5
    again_train, again_test = load_digits()
    np.testing.assert_array_equal(again_test.labels, test.labels)
    np.testing.assert_array_equal(again_train.images, train.images)


def write_image(path, size=(20, 12), color=(255, 0, 0)):
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", size, color)
    # A left-right gradient in the green channel reveals flips.
    px = img.load()
    for x in range(size[0]):
        for y in range(size[1]):
            px[x, y] = (color[0], int(255 * x / (size[0] - 1)), color[2])
    img.save(path)


@pytest.fixture
def folder(tmp_path):
    write_image(tmp_path / "cat" / "a.png")
    write_image(tmp_path / "cat" / "b.jpg", size=(16, 16))
    write_image(tmp_path / "dog" / "c.png", color=(0, 0, 255))
    (tmp_path / "dog" / "notes.txt").write_text("ignored: not an image extension")
    return tmp_path


def test_folder_classes_and_batches(folder):
    ds = ImageFolder(folder, image_size=8, resize=10, train=True)
    assert ds.class_names == ("cat", "dog") and len(ds) == 3
    batches = list(ds.batches(2, seed=0, epochs=2))
    assert len(batches) == 2  # drop_last in training: one batch of 2 per epoch
    images, labels = batches[0]
    assert images.shape == (2, 8, 8, 3) and images.dtype == np.float32 and labels.shape == (2,)
    split = ImageFolder(folder, image_size=8, train=False).to_split()
    np.testing.assert_array_equal(split.labels, [0, 0, 1])


def test_eval_centre_crop_is_deterministic_and_train_flips(folder):
    ev = ImageFolder(folder, image_size=8, resize=10, train=False)
    np.testing.assert_array_equal(ev.load(0), ev.load(0))
    tr = ImageFolder(folder, image_size=8, resize=8, train=True)
    rng = np.random.default_rng(0)
    # The green channel rises left to right; a flipped crop falls. Over 20 draws both
    # orientations appear (failure chance 2 * 2^-20 for a fair coin).
    rows = [tr.load(0, rng)[0, :, 1] for _ in range(20)]
    assert {bool(row[0] > row[-1]) for row in rows} == {True, False}


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"image folder {tmp_path / 'nope'} does not"):
        ImageFolder(tmp_path / "nope", image_size=8)


def test_folder_without_classes(tmp_path):
    with pytest.raises(ValueError, match="has no class sub-folders"):
        ImageFolder(tmp_path, image_size=8)


def test_empty_class_folder_is_named(folder):
    (folder / "emu").mkdir()
    with pytest.raises(ValueError, match=f"class folder {folder / 'emu'} holds no images"):
        ImageFolder(folder, image_size=8)


def test_unreadable_image_is_named(folder):
    bad = folder / "dog" / "broken.jpg"
    bad.write_bytes(b"this is not a jpeg")
    ds = ImageFolder(folder, image_size=8, train=False)
    with pytest.raises(ValueError, match=f"cannot decode image {bad}"):
        ds.to_split()


def test_bad_arguments(folder):
    with pytest.raises(ValueError, match="resize 4 must be >= image_size 8"):
        ImageFolder(folder, image_size=8, resize=4)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        next(ImageFolder(folder, image_size=8).batches(0))
