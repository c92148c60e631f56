//! Streams cut anywhere: the engine's results do not depend on how the
//! bytes arrive.
use super::*;

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..300, 1..20)
}

fn ios() -> impl Strategy<Value = Vec<Io>> {
    // Reads of the upper half, anywhere; writes of the lower, one after
    // the other: no two I/Os of a round overlap unless both read.
    prop::collection::vec((any::<bool>(), 0u64..100, 1u32..11), 1..12).prop_map(|v| {
        let mut next = 0;
        v.into_iter()
            .map(|(write, lba, blocks)| {
                let lba = if write {
                    next += blocks as u64;
                    next - blocks as u64
                } else {
                    128 + lba
                };
                Io { write, lba, blocks }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// However both byte streams are cut, every command completes once
    /// with its data, under any digests, PDU sizes and flow control.
    #[test]
    fn any_split_of_both_streams_gives_the_same_result(
        ios in ios(),
        cuts in cuts(),
        hd in any::<bool>(),
        dd in any::<bool>(),
        flow in any::<bool>(),
        chunk in prop::sample::select(vec![512u32, 1000, 4096, 1 << 20]),
        maxh2c in prop::sample::select(vec![4096u32, 8192]),
        icd in prop::sample::select(vec![0u32, 4096, 8192]),
    ) {
        let mut p = Pair::new(Digests { header: hd, data: dd }, maxh2c, chunk, flow, icd);
        exercise(&mut p, &ios, &cuts);
    }

    /// The host end reassembles a controller's stream cut anywhere into
    /// the same completions and data as the whole stream.
    #[test]
    fn host_reassembly_does_not_depend_on_the_cuts(
        sizes in prop::collection::vec(1u32..3000, 1..8),
        cuts in cuts(),
        hd in any::<bool>(),
        dd in any::<bool>(),
    ) {
        let digests = Digests { header: hd, data: dd };
        let params = HostParams { digests, cpda: 0, maxh2cdata: 4096 };
        let total: u32 = sizes.iter().sum();
        let mut stream = Vec::new();
        let mut off = 0;
        for (i, &s) in sizes.iter().enumerate() {
            let last = i + 1 == sizes.len();
            let data = pattern(i, s as usize);
            let (h, l) = C2HData::new(0, off, s, last, last, digests, 0).unwrap();
            let mut q = SendQueue::default();
            q.push_header(h.as_bytes(), &l);
            q.push_bytes(&data);
            if l.ddgst {
                q.push_bytes(&pollux_spec::tcp::data_digest([&data[..]]).to_le_bytes());
            }
            stream.extend(drain(&mut q, &mut Vec::new()));
            off += s;
        }
        let mut results = Vec::new();
        for split in [vec![usize::MAX], cuts.clone()] {
            let mut buf = vec![0u8; total as usize];
            let mut h = HostQueue::new(Pointers, addr(), 1, params, 1);
            let sqe = Sqe::rw(NvmOpcode::Read, 1, 0, 1);
            let a = buf.as_mut_ptr() as usize as u64;
            // SAFETY: `buf` is read only after the completion.
            unsafe { h.submit(0, sqe, Data::In { addr: a, len: total }, 0, false) }.unwrap();
            let mut done = Vec::new();
            let mut pending: Vec<u8> = Vec::new();
            let mut at = 0;
            let mut k = 0;
            while at < stream.len() {
                let n = split[k % split.len()].min(stream.len() - at);
                k += 1;
                pending.extend_from_slice(&stream[at..at + n]);
                at += n;
                let r = h.receive(&pending, u32::MAX, &mut |w, _, c| done.push((w, c.status)));
                prop_assert!(!r.failed);
                pending.drain(..r.consumed);
            }
            prop_assert!(pending.is_empty());
            results.push((done, buf));
        }
        prop_assert_eq!(&results[0], &results[1]);
        prop_assert_eq!(&results[0].0, &vec![(0u16, 0u16)]);
        let want: Vec<u8> = sizes.iter().enumerate().flat_map(|(i, &s)| pattern(i, s as usize)).collect();
        prop_assert_eq!(&results[0].1, &want);
    }

    /// The controller end reassembles a host's stream of capsules cut
    /// anywhere into the same commands and in-capsule data.
    #[test]
    fn target_reassembly_does_not_depend_on_the_cuts(
        sizes in prop::collection::vec(0u32..3000, 1..10),
        cuts in cuts(),
        hd in any::<bool>(),
        dd in any::<bool>(),
    ) {
        let digests = Digests { header: hd, data: dd };
        let params = HostParams { digests, cpda: 0, maxh2cdata: 4096 };
        let mut h = HostQueue::new(Pointers, addr(), 1, params, 16);
        let datas: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &s)| pattern(i, s as usize)).collect();
        for (i, d) in datas.iter().enumerate() {
            let sqe = Sqe::rw(NvmOpcode::Write, 1, i as u64, 1);
            // SAFETY: no buffer address: the bytes are copied at once.
            unsafe { h.submit(i as u16, sqe, Data::Bytes(d), i as u16, false) }.unwrap();
        }
        let mut stream = ic::host_icreq(digests).as_bytes().to_vec();
        stream.extend(drain(&mut h.tx, &mut Vec::new()));
        let mut results = Vec::new();
        for split in [vec![usize::MAX], cuts.clone()] {
            let mut q = TargetQueue::new(TargetLimits { maxh2cdata: 4096, icd: 8192 }, 4);
            let mut got: Vec<(u16, Vec<u8>, bool)> = Vec::new();
            let mut pending: Vec<u8> = Vec::new();
            let mut at = 0;
            let mut k = 0;
            while at < stream.len() {
                let n = split[k % split.len()].min(stream.len() - at);
                k += 1;
                pending.extend_from_slice(&stream[at..at + n]);
                at += n;
                let mut used = 0;
                loop {
                    let (u, ev) = q.next(&pending[used..]).expect("valid stream");
                    used += u;
                    let Some(ev) = ev else { break };
                    match ev {
                        TargetEvent::Capsule { sqe, data, end, .. } => {
                            let ok = matches!(end, Some(Ended::Capsule { digest_ok: true }));
                            got.push((sqe_of(sqe).cid, data.unwrap_or_default().to_vec(), ok));
                        }
                        TargetEvent::Data { offset, bytes, end } => {
                            let g = got.last_mut().unwrap();
                            prop_assert_eq!(offset as usize, g.1.len());
                            g.1.extend_from_slice(bytes);
                            if let Some(Ended::Capsule { digest_ok }) = end {
                                g.2 = digest_ok;
                            }
                        }
                        TargetEvent::End(Ended::Capsule { digest_ok }) => {
                            got.last_mut().unwrap().2 = digest_ok;
                        }
                        _ => {}
                    }
                }
                pending.drain(..used);
            }
            prop_assert!(pending.is_empty());
            results.push(got);
        }
        prop_assert_eq!(&results[0], &results[1]);
        let want: Vec<(u16, Vec<u8>, bool)> =
            datas.iter().enumerate().map(|(i, d)| (i as u16, d.clone(), true)).collect();
        prop_assert_eq!(&results[0], &want);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The controller end reads command capsules and H2CData where they
    /// lie instead of through `PduHeader::parse`: it refuses what that
    /// refuses, with the same FES, FEI and offending header, whatever
    /// byte of the header (or its digest) is changed.
    #[test]
    fn capsule_and_h2c_headers_are_checked_as_pdu_header_parse_checks_them(
        h2c in any::<bool>(),
        hd in any::<bool>(),
        at in 8usize..76,
        xor in 1u8..=255,
        datal in prop::sample::select(vec![512u32, 4096, 5000]),
    ) {
        let d = Digests { header: hd, data: false };
        let mut ctl = Ctl::new(4096, 4096, false);
        ctl.feed(ic::host_icreq(d).as_bytes()).unwrap();
        ctl.out();
        ctl.q.r2t(3, 9, 8192);
        let mut w = Sqe::rw(NvmOpcode::Write, 1, 0, 16);
        w.cid = 9;
        ctl.writes.insert(3, (w, vec![0; 8192]));
        ctl.out();
        let (mut pdu, layout) = if h2c {
            let (h, l) = pollux_spec::tcp::H2CData::new(9, 3, 0, 512, true, d, 0).unwrap();
            let mut h = h;
            // Any DATAL (the layout follows PLEN, which stays 512's).
            h.datal = datal;
            let mut v = h.as_bytes().to_vec();
            if hd {
                v.extend_from_slice(&pollux_spec::tcp::header_digest(h.as_bytes()).to_le_bytes());
            }
            v.resize(l.plen as usize, 0x42);
            (v, l)
        } else {
            let sqe = Sqe::rw(NvmOpcode::Read, 1, 0, 1);
            let (c, l) = pollux_spec::tcp::CapsuleCmd::new(&sqe, 0, d, 0).unwrap();
            let mut v = c.as_bytes().to_vec();
            if hd {
                v.extend_from_slice(&pollux_spec::tcp::header_digest(c.as_bytes()).to_le_bytes());
            }
            v.resize(l.plen as usize, 0);
            (v, l)
        };
        let hl = layout.header_len() as usize;
        if at < hl {
            pdu[at] ^= xor;
        }
        let cfg = *ctl.q.rx_config();
        let want = pollux_spec::tcp::PduHeader::parse(&pdu, &layout, &cfg);
        // (The whole PDU is there: one call takes it.)
        let got = ctl.q.next(&pdu).map(|(n, _)| n);
        match want {
            Err(e) => {
                let Err(TargetError::Fatal { fes, fei, header, .. }) = got else {
                    panic!("{e:?} but the engine gave {got:?}");
                };
                prop_assert_eq!((fes, fei), (e.fes().unwrap_or(Fes::INVALID_HEADER_FIELD), e.fei()));
                prop_assert_eq!(header, pdu[..hl].to_vec());
            }
            // Taken, or refused by the transfer's own checks (TTAG,
            // CCCID, range), which come after.
            Ok(_) => {
                if let Err(TargetError::Fatal { fes, fei, .. }) = got {
                    prop_assert!(h2c);
                    let transfer = [Field::Ttag.offset(), Field::Cccid.offset()].contains(&fei)
                        || fes == Fes::DATA_TRANSFER_OUT_OF_RANGE;
                    prop_assert!(transfer, "{:?} {}", fes, fei);
                }
            }
        }
    }
}
