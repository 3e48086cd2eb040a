use crate::redact::SecretMatch;

use super::*;

/// A manifest of file rows `(path, tag)`: digest `[tag; 32]`, size `tag`.
fn files<'a>(rows: impl IntoIterator<Item = (&'a str, u8)>) -> Vec<u8> {
    let mut w = ManifestWriter::with_capacity(0);
    for (path, tag) in rows {
        w.file(path, &[tag; 32], u64::from(tag), 0o644, 1);
    }
    w.finish()
}

fn json(text: &str) -> String {
    let mut out = Vec::new();
    write_json_string(&mut out, text);
    String::from_utf8(out).unwrap()
}

/// Found by searching for a few digests or by reading every row, the
/// same files: each row whose content has a wanted digest, once, never
/// a row whose name only spells one.
#[test]
fn files_with_digests_search_as_rows_say() {
    let (a, b, c) = ([0xa1u8; 32], [0xb2u8; 32], [0xc3u8; 32]);
    let mut w = ManifestWriter::with_capacity(0);
    w.file(crate::hash::to_hex(&a).as_str(), &a, 1, 0o644, 1);
    w.file("d/\"x", &b, 2, 0o644, 1);
    w.dir(crate::hash::to_hex(&c).as_str(), 0o755);
    w.file("e", &a, 3, 0o644, 1);
    w.file(
        format!("f{}", crate::hash::to_hex(&c)).as_str(),
        &b,
        4,
        0o644,
        1,
    );
    let data = w.finish();
    let mut wanted = vec![a, c];
    wanted.sort();
    let found = files_with_digests(&data, &wanted).unwrap();
    let names: Vec<&str> = found.iter().map(|(p, _, _)| p.as_str()).collect();
    assert_eq!(names, [crate::hash::to_hex(&a).as_str(), "e"]);
    let many: Vec<[u8; 32]> = (0..=64u8).map(|n| [n; 32]).collect();
    let mut all = many.clone();
    all.extend([a, b]);
    all.sort();
    let read = files_with_digests(&data, &all).unwrap();
    assert_eq!(read.len(), 4);
    let searched = files_with_digests(&data, &[b]).unwrap();
    assert_eq!(searched.iter().map(|f| f.2).collect::<Vec<_>>(), [2, 4]);
}

/// The merged delta rebuilds the new manifest and inserts exactly the
/// rows the base lacks; rows out of path order still rebuild it.
#[test]
fn a_delta_rebuilds_the_new_manifest_and_inserts_only_new_rows() {
    let build = |rows: &[(&str, u8)]| files(rows.iter().copied());
    let base = build(&[("a", 1), ("b", 1), ("c", 1), ("d/e", 1), ("f", 1), ("g", 1)]);
    let cases: [(Vec<(&str, u8)>, usize); 5] = [
        (
            vec![("a", 1), ("b", 2), ("c", 1), ("d/e", 1), ("f", 1), ("g", 1)],
            1,
        ),
        (vec![("0", 1), ("a", 1), ("c", 1), ("f", 1), ("h", 3)], 2),
        (vec![("g", 1), ("a", 1), ("f", 1)], 2),
        (vec![], 0),
        (
            vec![("a", 1), ("b", 1), ("c", 1), ("d/e", 1), ("f", 1), ("g", 1)],
            0,
        ),
    ];
    for (rows, inserted) in cases {
        let new = build(&rows);
        let (ops, added) = delta(&base, &new).unwrap();
        assert_eq!(apply(&base, &ops).unwrap(), new, "{rows:?}");
        assert_eq!(added, inserted, "{rows:?}");
    }
}

/// A chain of deltas applied at once gives what applying each in turn
/// gives: rows inserted by one delta and copied or dropped by the next.
#[test]
fn a_chain_of_deltas_applies_as_each_in_turn() {
    let version = |names: &[&str]| {
        let mut w = ManifestWriter::with_capacity(0);
        for (i, name) in names.iter().enumerate() {
            if i % 3 == 0 {
                w.dir(*name, 0o755);
            } else {
                w.file(*name, &[i as u8; 32], i as u64, 0o644, 7);
            }
        }
        w.finish()
    };
    let versions = [
        version(&["a", "b", "c", "d"]),
        version(&["a", "b,x", "c", "d", "e"]),
        version(&["b,x", "c", "e", "f"]),
        version(&[]),
        version(&["z"]),
    ];
    let deltas: Vec<Vec<u8>> = versions
        .windows(2)
        .map(|w| delta(&w[0], &w[1]).unwrap().0)
        .collect();
    for end in 1..versions.len() {
        let chain: Vec<&[u8]> = deltas[..end].iter().map(Vec::as_slice).collect();
        assert_eq!(apply_chain(&versions[0], &chain).unwrap(), versions[end]);
        assert_eq!(
            apply(&versions[end - 1], chain[end - 1]).unwrap(),
            versions[end]
        );
    }
    assert!(apply_chain(&versions[0], &[b"C\x00\x00\x00\x00\x09\x00\x00\x00"]).is_err());
}

/// Both ways of `difference` (a merge; bisection for a short `a`) give
/// what a set difference gives.
#[test]
fn difference_is_the_set_difference() {
    let digest = |n: u32| {
        let mut d = [0u8; 32];
        d[..4].copy_from_slice(&n.to_be_bytes());
        d[31] = (n % 7) as u8;
        d
    };
    let flat = |ns: &[u32]| ns.iter().flat_map(|&n| digest(n)).collect::<Vec<u8>>();
    let b: Vec<u32> = (0..4000).filter(|n| n % 3 != 0).collect();
    for a in [
        vec![0, 1, 2, 3, 3999, 4000, 5000],
        (0..4100).filter(|n| n % 5 != 0).collect::<Vec<u32>>(),
        vec![],
    ] {
        let want: Vec<u32> = a.iter().copied().filter(|n| !b.contains(n)).collect();
        assert_eq!(difference(&flat(&a), &flat(&b)), flat(&want));
        assert_eq!(difference(&flat(&b), &flat(&a)).len() % 32, 0);
    }
    assert_eq!(difference(&flat(&[1, 2]), &[]), flat(&[1, 2]));
}

#[test]
fn spans_are_read_from_the_rows_that_carry_them() {
    let mut plain = ManifestWriter::with_capacity(0);
    plain.file("a,]\"b", &[1; 32], 3, 0o644, -5);
    plain.dir("d", 0o755);
    plain.symlink("l", "x");
    let plain = plain.finish();
    assert_eq!(spanned_files(&plain), Ok(vec![]));
    let mut spanned = ManifestWriter::with_capacity(0);
    spanned.file("a", &[1; 32], 3, 0o644, 5);
    let fields = FileFields {
        hash: &[2; 32],
        size: 9,
        mode: 0o644,
        mtime_ns: 5,
        chunks: None,
    };
    spanned.file_with_chunks(
        "b",
        &fields,
        &[SecretMatch {
            offset: 1,
            len: 4,
            secret: 0,
        }],
    );
    let spanned = spanned.finish();
    let span = |offset, secret| Span {
        offset,
        length: 4,
        secret,
    };
    assert_eq!(
        spanned_files(&spanned),
        Ok(vec![SpannedFile {
            path: "b".into(),
            digest: [2; 32],
            size: 9,
            spans: vec![span(1, SecretRef::Index(0))],
        }])
    );
    // Names (a mapping's secrets) and a chunk list before the triples.
    let hex = "03".repeat(32);
    let named = format!(r#"[["f","c","{hex}",12,420,-1,"x",0,4,"t\u00e9",8,4,1]]"#);
    let found = spanned_files(named.as_bytes()).unwrap();
    assert_eq!(
        found[0].spans,
        vec![
            span(0, SecretRef::Name("t\u{e9}".into())),
            span(8, SecretRef::Index(1))
        ]
    );
    assert!(spanned_files(b"[[\"f\",\"a\"]]").is_err());
    let short = format!(r#"[["f","c","{hex}",12,420,-1,0,4]]"#);
    assert!(spanned_files(short.as_bytes()).is_err());
    assert_eq!(
        row_path(br#"["d","a\"b\u00e9",493]"#).unwrap(),
        "a\"b\u{e9}"
    );
}

#[test]
fn fragments_join_into_the_same_bytes() {
    let write = |w: &mut ManifestWriter, i: u64| {
        w.file(
            format!("f{i}").as_str(),
            &[i as u8; 32],
            i,
            0o644,
            -(i as i64),
        );
        w.dir(format!("d{i}").as_str(), 0o755);
    };
    let mut whole = ManifestWriter::with_capacity(0);
    (0..7).for_each(|i| write(&mut whole, i));
    let whole = whole.finish();
    let mut parts = Vec::new();
    for range in [0..3, 3..3, 3..6, 6..7] {
        let mut w = ManifestWriter::fragment(0);
        range.for_each(|i| write(&mut w, i));
        parts.push(w.into_fragment());
    }
    assert_eq!(ManifestWriter::join(parts), whole);
    assert_eq!(ManifestWriter::join(Vec::new()), b"[]");
    assert_eq!(rows(&whole).unwrap().len(), 14);
}

#[test]
fn rows_deltas_and_keys() {
    let mut w = ManifestWriter::with_capacity(0);
    w.dir("a", 0o755);
    w.file("a/\"q]", &[1u8; 32], 3, 0o644, 7);
    w.file("a/b", &[2u8; 32], 4, 0o644, 7);
    w.symlink("a/l", "b");
    let base = w.finish();
    assert_eq!(rows(&base).unwrap().len(), 4);
    assert_eq!(totals(&base).unwrap(), (4, 2, 7));
    assert_eq!(digests(&base).unwrap(), vec![[1u8; 32], [2u8; 32]]);
    let mut w = ManifestWriter::with_capacity(0);
    w.dir("a", 0o755);
    w.file("a/\"q]", &[1u8; 32], 3, 0o644, 7);
    w.file("a/c", &[3u8; 32], 5, 0o644, 8);
    w.symlink("a/l", "b");
    let new = w.finish();
    let (ops, added) = delta(&base, &new).unwrap();
    assert_eq!(added, 1);
    assert_eq!(apply(&base, &ops).unwrap(), new);
    let (same, none) = delta(&base, &base).unwrap();
    assert_eq!((same.len(), none), (9, 0));
    assert_eq!(apply(&base, &same).unwrap(), base);
    let empty = ManifestWriter::with_capacity(0).finish();
    let (ops, _) = delta(&base, &empty).unwrap();
    assert_eq!(apply(&base, &ops).unwrap(), empty);
    let files = files_with_digests(&new, &[[3u8; 32]]).unwrap();
    assert_eq!(files, vec![("a/c".to_string(), [3u8; 32], 5)]);
    let files = files_with_digests(&new, &[[1u8; 32]]).unwrap();
    assert_eq!(files[0].0, "a/\"q]");
    assert_eq!(
        json_string(b"\"\\u00e9\\ud83d\\ude00\\n\"").unwrap(),
        "é😀\n"
    );
    assert!(rows(b"[[\"d\",\"a\",1]").is_err());
}

#[test]
fn counted_sliced_and_grown_encodings_agree() {
    fn rows<S: Sink>(sink: S) -> S {
        let mut w = ManifestWriter::rows_into(sink);
        w.dir(("", "d\"q"), 0o755);
        w.file(("d\"q", "f\n\u{1}é"), &[9u8; 32], 0, 0o644, i64::MIN + 1);
        let found = [SecretMatch {
            offset: 10,
            len: 4,
            secret: 1,
        }];
        let fields = FileFields {
            hash: &[1u8; 32],
            size: u64::MAX,
            mode: 0o600,
            mtime_ns: -1,
            chunks: None,
        };
        w.file_with_chunks("d/s", &fields, &found);
        w.symlink(("a/b", "l"), "../t\\x");
        w.into_sink()
    }
    let grown = rows(Vec::new());
    assert_eq!(rows(Counter::default()).0, grown.len());
    let mut buf = vec![0u8; grown.len()];
    let written = rows(SliceWriter {
        buf: &mut buf,
        at: 0,
    })
    .at;
    assert_eq!((written, &buf), (grown.len(), &grown));
    let text = String::from_utf8(grown).unwrap();
    assert!(text.starts_with("[\"d\",\"d\\\"q\",493],[\"f\",\"d\\\"q/f\\n\\u0001é\""));
    assert!(text.contains(",-9223372036854775807]"), "{text}");
    assert!(
        text.contains(",18446744073709551615,384,-1,10,4,1]"),
        "{text}"
    );
    assert!(text.ends_with("[\"l\",\"a/b/l\",\"../t\\\\x\"]"), "{text}");
}

#[test]
fn escaping_matches_python() {
    assert_eq!(json("plain"), "\"plain\"");
    assert_eq!(json("q\"b\\s"), "\"q\\\"b\\\\s\"");
    assert_eq!(json("a\nb\tc\r\u{8}\u{c}"), "\"a\\nb\\tc\\r\\b\\f\"");
    assert_eq!(json("\u{1}\u{1f}\u{7f}"), "\"\\u0001\\u001f\u{7f}\"");
    assert_eq!(json("é→😀\u{2028}"), "\"é→😀\u{2028}\"");
}

#[test]
fn writer_rows() {
    let mut w = ManifestWriter::with_capacity(0);
    w.dir("d", 0o755);
    w.file("d/f", &[0u8; 32], 3, 0o644, -5);
    w.symlink("d/l", "f");
    assert_eq!(w.rows(), 3);
    let text = String::from_utf8(w.finish()).unwrap();
    let zeros = "0".repeat(64);
    assert_eq!(
        text,
        format!("[[\"d\",\"d\",493],[\"f\",\"d/f\",\"{zeros}\",3,420,-5],[\"l\",\"d/l\",\"f\"]]")
    );
    assert_eq!(
        String::from_utf8(ManifestWriter::with_capacity(0).finish()).unwrap(),
        "[]"
    );
}

#[test]
fn decode_inverts_the_writer() {
    let mut w = ManifestWriter::with_capacity(0);
    w.dir("d", 0o755);
    w.file("d/f \"q\"\n\u{1}é😀", &[7u8; 32], 3, 0o644, -5);
    w.symlink("d/l", "f\\x");
    let rows = decode(&w.finish()).unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[1].path(), "d/f \"q\"\n\u{1}é😀");
    assert_eq!(
        rows[1],
        ManifestRow::File {
            path: "d/f \"q\"\n\u{1}é😀".into(),
            hash: [7u8; 32],
            size: 3,
            mode: 0o644,
            mtime_ns: -5,
            secrets: false
        }
    );
    assert_eq!(
        rows[2],
        ManifestRow::Symlink {
            path: "d/l".into(),
            target: "f\\x".into()
        }
    );
    // Python's json with default separators and \u escapes of a pair.
    let spaced = br#"[ ["d", "a", 448], ["l", "\ud83d\ude00", "\u00e9"] ]"#;
    let rows = decode(spaced).unwrap();
    assert_eq!(rows[1].path(), "😀");
    assert_eq!(decode(b"[]").unwrap(), vec![]);
    for bad in [
        &b"["[..],
        b"[[\"x\",\"a\",1]]",
        b"[[\"d\",\"a\",-1]]",
        b"[] x",
        b"[[\"f\",\"a\",\"00\",1,1,1]]",
    ] {
        assert!(decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
}

#[test]
fn new_files_match_digests_differences_and_files_with_digests() {
    let mut w = ManifestWriter::with_capacity(0);
    w.dir("d", 0o755);
    for (path, tag) in [
        ("d/a", 1u8),
        ("d/b", 2),
        ("d/c", 3),
        ("d/copy", 3),
        ("e", 4),
    ] {
        w.file(path, &[tag; 32], u64::from(tag), 0o644, 5);
    }
    let data = w.finish();
    let known = [[1u8; 32], [9; 32]].concat();
    let fed = [2u8; 32].to_vec();
    let found = new_files(&data, &known, &fed).unwrap();
    let all: Vec<u8> = digests(&data).unwrap().concat();
    let expected = difference(&difference(&all, &known), &fed);
    assert_eq!(found.digests, expected);
    let wanted: Vec<[u8; 32]> = expected.chunks(32).map(|d| d.try_into().unwrap()).collect();
    assert_eq!(found.files, files_with_digests(&data, &wanted).unwrap());
    let paths: Vec<&str> = found.files.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(paths, ["d/c", "d/copy", "e"]);
}

/// What a manifest adds to its base's digests, read from the rows its
/// delta inserts, is what reading every row gives; a delta that patches
/// rows has no bytes for them and says so.
#[test]
fn new_files_of_a_delta_are_those_of_the_manifest_it_makes() {
    let build = |rows: &[(&str, u8)]| files(rows.iter().copied());
    let base = build(&[("a", 1), ("b", 2), ("c", 3), ("d", 4)]);
    let known: Vec<u8> = digests(&base).unwrap().concat();
    for rows in [
        vec![("a", 1), ("b", 5), ("c", 3), ("d", 4), ("e", 6)],
        vec![("a", 2), ("c", 7), ("c2", 7), ("d", 4)],
        vec![("a", 1)],
        vec![],
    ] {
        let new = build(&rows);
        let (ops, _) = delta(&base, &new).unwrap();
        let inserted = inserted_rows(&ops).unwrap().expect("no patches");
        let fed = [6u8; 32].to_vec();
        let from_delta = new_files(&inserted, &known, &fed).unwrap();
        let whole = new_files(&new, &known, &fed).unwrap();
        assert_eq!(from_delta.digests, whole.digests, "{rows:?}");
        assert_eq!(from_delta.files, whole.files, "{rows:?}");
    }
    let mut patch = b"P".to_vec();
    patch.extend_from_slice(&0u32.to_le_bytes());
    patch.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(inserted_rows(&patch).unwrap(), None);
}

/// Deltas of random edits (rows changed, dropped, added, and rows out of
/// path order) rebuild the new manifest, and between sorted manifests they
/// insert exactly the rows the base lacks.
#[test]
fn deltas_of_random_edits_rebuild_and_insert_only_new_rows() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let build = |rows: &[(String, u8)]| files(rows.iter().map(|(p, v)| (p.as_str(), *v)));
    for case in 0..300 {
        let count = next(60) as usize;
        let base: Vec<(String, u8)> = (0..count).map(|i| (format!("d/{i:04}"), 1)).collect();
        let mut new: Vec<(String, u8)> = Vec::new();
        for (path, version) in &base {
            match next(10) {
                0 => {}
                1 => new.push((path.clone(), version + 1)),
                2 => {
                    new.push((path.clone(), *version));
                    new.push((format!("{path}x"), 3));
                }
                _ => new.push((path.clone(), *version)),
            }
        }
        if next(4) == 0 {
            new.push(("0".into(), 4));
        }
        let sorted = case % 5 != 0;
        if sorted {
            new.sort();
        } else if !new.is_empty() {
            let at = next(new.len() as u64) as usize;
            let moved = new.remove(at);
            new.push(moved);
        }
        let (old_bytes, new_bytes) = (build(&base), build(&new));
        let (ops, added) = delta(&old_bytes, &new_bytes).unwrap();
        assert_eq!(apply(&old_bytes, &ops).unwrap(), new_bytes, "case {case}");
        if sorted {
            let lacking = new.iter().filter(|row| !base.contains(row)).count();
            assert_eq!(added, lacking, "case {case}");
        }
    }
}
