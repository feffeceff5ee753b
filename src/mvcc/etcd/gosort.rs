//! A port of Go's `sort.Sort` (Go >= 1.19: pattern-defeating quicksort), so that results
//! whose sort keys tie come out in exactly the order etcd 3.4 (built with Go >= 1.19)
//! returns them. `sort.Sort` is not stable; which of several equal elements ends up
//! first depends on every step of the algorithm, so the steps, constants and the
//! deterministic "random" pattern breaking all follow Go's implementation.
//!
//! # Invariants
//! - Only `less` and swaps touch the data, in the same sequence as Go's `sort.Interface`
//!   calls, so any `less` gives the same permutation Go would produce with that `Less`.

/// Slices of at most this many elements are sorted by insertion sort.
const MAX_INSERTION: usize = 12;
/// From this length on the pivot is Tukey's ninther instead of a median of three.
const SHORTEST_NINTHER: usize = 50;
/// `choose_pivot` makes at most this many swaps (4 medians of 3 comparisons each).
const MAX_SWAPS: usize = 4 * 3;
/// `partial_insertion_sort`: at most this many adjacent out-of-order pairs are fixed.
const MAX_STEPS: usize = 5;
/// `partial_insertion_sort` shifts nothing in slices shorter than this.
const SHORTEST_SHIFTING: usize = 50;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Hint {
    Unknown,
    Increasing,
    Decreasing,
}

/// Go's `sort.Sort(data)` where `data.Less(i, j) == less(&v[i], &v[j])`.
pub fn sort_by<T>(v: &mut [T], less: impl FnMut(&T, &T) -> bool) {
    let n = v.len();
    if n <= 1 {
        return;
    }
    let mut s = Sorter { v, less };
    s.pdqsort(0, n, bits_len(n));
}

/// Go's `sort.Sort(sort.Reverse(data))`: the same algorithm with `less` reversed.
pub fn sort_by_reverse<T>(v: &mut [T], mut less: impl FnMut(&T, &T) -> bool) {
    sort_by(v, |a, b| less(b, a));
}

/// `bits.Len`: the number of bits needed to represent `x` (0 for 0).
fn bits_len(x: usize) -> usize {
    (usize::BITS - x.leading_zeros()) as usize
}

/// Go's 64-bit xorshift generator as used by `breakPatterns` (shifts 13, 17, 5).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
}

struct Sorter<'a, T, F> {
    v: &'a mut [T],
    less: F,
}

impl<T, F: FnMut(&T, &T) -> bool> Sorter<'_, T, F> {
    fn less(&mut self, i: usize, j: usize) -> bool {
        (self.less)(&self.v[i], &self.v[j])
    }

    fn swap(&mut self, i: usize, j: usize) {
        self.v.swap(i, j);
    }

    /// Sorts `[a, b)` by straight insertion.
    fn insertion_sort(&mut self, a: usize, b: usize) {
        for i in a + 1..b {
            let mut j = i;
            while j > a && self.less(j, j - 1) {
                self.swap(j, j - 1);
                j -= 1;
            }
        }
    }

    /// Restores the max-heap property below `root` in the heap `first + [lo, hi)`.
    fn sift_down(&mut self, lo: usize, hi: usize, first: usize) {
        let mut root = lo;
        loop {
            let mut child = 2 * root + 1;
            if child >= hi {
                return;
            }
            if child + 1 < hi && self.less(first + child, first + child + 1) {
                child += 1;
            }
            if !self.less(first + root, first + child) {
                return;
            }
            self.swap(first + root, first + child);
            root = child;
        }
    }

    fn heap_sort(&mut self, a: usize, b: usize) {
        let first = a;
        let hi = b - a;
        for i in (0..=(hi - 1) / 2).rev() {
            self.sift_down(i, hi, first);
        }
        for i in (0..hi).rev() {
            self.swap(first, first + i);
            self.sift_down(0, i, first);
        }
    }

    /// Sorts `[a, b)`; `limit` is the number of imbalanced partitions allowed before
    /// falling back to heap sort.
    fn pdqsort(&mut self, mut a: usize, mut b: usize, mut limit: usize) {
        let mut was_balanced = true;
        let mut was_partitioned = true;
        loop {
            let length = b - a;
            if length <= MAX_INSERTION {
                self.insertion_sort(a, b);
                return;
            }
            if limit == 0 {
                self.heap_sort(a, b);
                return;
            }
            if !was_balanced {
                self.break_patterns(a, b);
                limit -= 1;
            }

            let (mut pivot, mut hint) = self.choose_pivot(a, b);
            if hint == Hint::Decreasing {
                self.reverse_range(a, b);
                // The pivot was pivot-a elements after the start; now it is that many
                // before the end.
                pivot = (b - 1) - (pivot - a);
                hint = Hint::Increasing;
            }

            // Probably already sorted.
            if was_balanced
                && was_partitioned
                && hint == Hint::Increasing
                && self.partial_insertion_sort(a, b)
            {
                return;
            }

            // The element just before this range is a pivot of an enclosing partition and
            // nothing here is smaller than it; if the chosen pivot equals it, split off the
            // elements equal to the pivot (many duplicates likely).
            if a > 0 && !self.less(a - 1, pivot) {
                a = self.partition_equal(a, b, pivot);
                continue;
            }

            let (mid, already_partitioned) = self.partition(a, b, pivot);
            was_partitioned = already_partitioned;

            let (left_len, right_len) = (mid - a, b - mid);
            let balance_threshold = length / 8;
            if left_len < right_len {
                was_balanced = left_len >= balance_threshold;
                self.pdqsort(a, mid, limit);
                a = mid + 1;
            } else {
                was_balanced = right_len >= balance_threshold;
                self.pdqsort(mid + 1, b, limit);
                b = mid;
            }
        }
    }

    /// One quicksort partition of `[a, b)` around the element at `pivot`: afterwards the
    /// pivot is at the returned index, everything before it is less and everything after
    /// it is not less. Also reports whether no element had to move.
    fn partition(&mut self, a: usize, b: usize, pivot: usize) -> (usize, bool) {
        self.swap(a, pivot);
        // i and j are inclusive bounds of what remains to be partitioned. j can drop to
        // a (never below), so signed arithmetic is not needed.
        let (mut i, mut j) = (a + 1, b - 1);
        while i <= j && self.less(i, a) {
            i += 1;
        }
        while i <= j && !self.less(j, a) {
            j -= 1;
        }
        if i > j {
            self.swap(j, a);
            return (j, true);
        }
        self.swap(i, j);
        i += 1;
        j -= 1;
        loop {
            while i <= j && self.less(i, a) {
                i += 1;
            }
            while i <= j && !self.less(j, a) {
                j -= 1;
            }
            if i > j {
                break;
            }
            self.swap(i, j);
            i += 1;
            j -= 1;
        }
        self.swap(j, a);
        (j, false)
    }

    /// Partitions `[a, b)`, which holds nothing less than the pivot, into the elements
    /// equal to the pivot followed by the greater ones; returns where the greater start.
    fn partition_equal(&mut self, a: usize, b: usize, pivot: usize) -> usize {
        self.swap(a, pivot);
        let (mut i, mut j) = (a + 1, b - 1);
        loop {
            while i <= j && !self.less(a, i) {
                i += 1;
            }
            while i <= j && self.less(a, j) {
                j -= 1;
            }
            if i > j {
                break;
            }
            self.swap(i, j);
            i += 1;
            j -= 1;
        }
        i
    }

    /// Fixes a few out-of-order adjacent pairs; true if `[a, b)` ends up sorted.
    fn partial_insertion_sort(&mut self, a: usize, b: usize) -> bool {
        let mut i = a + 1;
        for _ in 0..MAX_STEPS {
            while i < b && !self.less(i, i - 1) {
                i += 1;
            }
            if i == b {
                return true;
            }
            if b - a < SHORTEST_SHIFTING {
                return false;
            }
            self.swap(i, i - 1);
            // Shift the smaller one to the left (Go walks down to index 1 of the whole
            // data, not just to a).
            if i - a >= 2 {
                let mut j = i - 1;
                while j >= 1 {
                    if !self.less(j, j - 1) {
                        break;
                    }
                    self.swap(j, j - 1);
                    j -= 1;
                }
            }
            // Shift the greater one to the right.
            if b - i >= 2 {
                let mut j = i + 1;
                while j < b {
                    if !self.less(j, j - 1) {
                        break;
                    }
                    self.swap(j, j - 1);
                    j += 1;
                }
            }
        }
        false
    }

    /// Swaps three elements around the middle with pseudo-random ones, seeded by the
    /// length, to break patterns that cause imbalanced partitions.
    fn break_patterns(&mut self, a: usize, b: usize) {
        let length = b - a;
        if length >= 8 {
            let mut random = XorShift(length as u64);
            // nextPowerOfTwo: 1 << bits.Len(length).
            let modulus = 1usize << bits_len(length);
            // The three elements around the middle: a + length/4*2 - 1 ..= a + length/4*2 + 1.
            let first = a + (length / 4) * 2 - 1;
            for idx in first..first + 3 {
                let mut other = (random.next() as usize) & (modulus - 1);
                if other >= length {
                    other -= length;
                }
                self.swap(idx, a + other);
            }
        }
    }

    /// Picks a pivot index in `[a, b)`: fixed for fewer than 8 elements, median of three
    /// below `SHORTEST_NINTHER`, Tukey's ninther above. The hint says whether the
    /// samples looked increasing (no swaps) or decreasing (all swaps).
    fn choose_pivot(&mut self, a: usize, b: usize) -> (usize, Hint) {
        let l = b - a;
        let mut swaps = 0;
        let mut i = a + l / 4;
        let mut j = a + l / 4 * 2;
        let mut k = a + l / 4 * 3;
        if l >= 8 {
            if l >= SHORTEST_NINTHER {
                i = self.median_adjacent(i, &mut swaps);
                j = self.median_adjacent(j, &mut swaps);
                k = self.median_adjacent(k, &mut swaps);
            }
            j = self.median(i, j, k, &mut swaps);
        }
        let hint = match swaps {
            0 => Hint::Increasing,
            MAX_SWAPS => Hint::Decreasing,
            _ => Hint::Unknown,
        };
        (j, hint)
    }

    /// Returns `(a, b)` or `(b, a)` so that the first is not greater, counting swaps.
    fn order2(&mut self, a: usize, b: usize, swaps: &mut usize) -> (usize, usize) {
        if self.less(b, a) {
            *swaps += 1;
            (b, a)
        } else {
            (a, b)
        }
    }

    /// The index among `a`, `b`, `c` holding the median.
    fn median(&mut self, a: usize, b: usize, c: usize, swaps: &mut usize) -> usize {
        let (a, b) = self.order2(a, b, swaps);
        let (b, _) = self.order2(b, c, swaps);
        let (_, b) = self.order2(a, b, swaps);
        b
    }

    /// The index among `a - 1`, `a`, `a + 1` holding the median.
    fn median_adjacent(&mut self, a: usize, swaps: &mut usize) -> usize {
        self.median(a - 1, a, a + 1, swaps)
    }

    fn reverse_range(&mut self, a: usize, b: usize) {
        let (mut i, mut j) = (a, b - 1);
        while i < j {
            self.swap(i, j);
            i += 1;
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn is_sorted(v: &[(u32, usize)]) -> bool {
        v.windows(2).all(|w| w[0].0 <= w[1].0)
    }

    #[test]
    fn sorts_like_a_sort() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for n in [0, 1, 2, 7, 8, 12, 13, 49, 50, 51, 100, 1000, 5000] {
            for distinct in [1, 2, 5, 1000] {
                let orig: Vec<(u32, usize)> =
                    (0..n).map(|i| (rng.gen_range(0..distinct), i)).collect();
                let mut patterns = vec![orig.clone()];
                let mut asc = orig.clone();
                asc.sort();
                patterns.push(asc.clone());
                asc.reverse();
                patterns.push(asc);
                for mut v in patterns {
                    let mut w = v.clone();
                    sort_by(&mut v, |a, b| a.0 < b.0);
                    assert!(is_sorted(&v), "n={n}");
                    sort_by_reverse(&mut w, |a, b| a.0 < b.0);
                    w.reverse();
                    assert!(is_sorted(&w), "n={n}");
                    let mut ids: Vec<usize> = v.iter().map(|e| e.1).collect();
                    ids.sort();
                    assert_eq!(ids, (0..n).collect::<Vec<_>>());
                }
            }
        }
    }
}
