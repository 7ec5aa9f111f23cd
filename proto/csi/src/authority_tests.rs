use super::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SOCKET: &str = "/var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock";
const DATA: u8 = 0x0;
const SETTINGS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    put_frame_header(&mut out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
    out.to_vec()
}

/// (type, flags, stream, payload) of each frame after the preface.
fn frames(mut bytes: &[u8]) -> Vec<(u8, u8, u32, Vec<u8>)> {
    assert_eq!(&bytes[..PREFACE_LEN], PREFACE);
    bytes = &bytes[PREFACE_LEN..];
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let stream = u32::from_be_bytes(bytes[5..9].try_into().unwrap());
        frames.push((bytes[3], bytes[4], stream, bytes[9..9 + len].to_vec()));
        bytes = &bytes[9 + len..];
    }
    frames
}

fn request(authority: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/csi.v1.Node/NodeGetInfo"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", "grpc-java-netty/1.79.0"),
    ]
    .iter()
    .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

fn encode(encoder: &mut Encoder<'static>, fields: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    encoder.encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

/// Runs `input` through a filter `chunk` bytes at a time.
fn filter(input: &[u8], chunk: usize) -> Result<Vec<u8>, FilterError> {
    let mut filter = AuthorityFilter::new("pid 1 uid 0".to_owned());
    let mut out = BytesMut::new();
    for piece in input.chunks(chunk) {
        filter.push(piece, &mut out)?;
    }
    Ok(out.to_vec())
}

/// A grpc-java-like client: two requests on streams 1 and 3, the second
/// referring to the first's dynamic table entries; the first HEADERS is
/// padded and has a priority, the second is split into a CONTINUATION.
fn java_client(authority: &str) -> Vec<u8> {
    let mut client = Encoder::new();
    let fields = request(authority);
    let first = encode(&mut client, &fields);
    let second = encode(&mut client, &fields);
    assert!(second.len() < first.len(), "the second block uses the dynamic table");
    let mut padded = vec![3];
    padded.extend_from_slice(&[0x80, 0, 0, 0, 15]);
    padded.extend_from_slice(&first);
    padded.extend_from_slice(&[0; 3]);
    let (head, tail) = second.split_at(2);
    [
        PREFACE.to_vec(),
        frame(SETTINGS, 0, 0, &[0, 4, 0, 0x10, 0, 0]),
        frame(HEADERS, END_HEADERS | PADDED | PRIORITY, 1, &padded),
        frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"),
        frame(HEADERS, 0, 3, head),
        frame(CONTINUATION, END_HEADERS, 3, tail),
        frame(DATA, END_STREAM, 3, b"\0\0\0\0\0"),
    ]
    .concat()
}

#[test]
fn rewrites_a_socket_path_authority_in_every_request() {
    let before = rewritten_total();
    for chunk in [1, 7, usize::MAX] {
        let out = filter(&java_client(SOCKET), chunk).unwrap();
        let frames = frames(&out);
        let kinds: Vec<_> = frames.iter().map(|f| (f.0, f.1, f.2)).collect();
        assert_eq!(
            kinds,
            [
                (SETTINGS, 0, 0),
                (HEADERS, END_HEADERS | PRIORITY, 1),
                (DATA, END_STREAM, 1),
                (HEADERS, END_HEADERS, 3),
                (DATA, END_STREAM, 3)
            ],
            "chunk {chunk}"
        );
        assert_eq!(frames[0].3, [0, 4, 0, 0x10, 0, 0]);
        assert_eq!(&frames[1].3[..PRIORITY_LEN], [0x80, 0, 0, 0, 15]);
        // What h2 decodes, with its own context.
        let mut server = Decoder::new();
        let expected = request("localhost");
        assert_eq!(server.decode(&frames[1].3[PRIORITY_LEN..]).unwrap(), expected);
        assert_eq!(server.decode(&frames[3].3).unwrap(), expected);
        assert_eq!(frames[2].3, b"\0\0\0\0\0");
    }
    // Other tests rewrite too, in parallel: at least these six.
    assert!(rewritten_total() - before >= 6, "every rewrite counted");
}

#[test]
fn rewrites_a_percent_encoded_path_and_keeps_valid_authorities() {
    for (sent, served) in [
        ("%2Frun%2Fcsi.sock", "localhost"),
        ("", "localhost"),
        ("localhost", "localhost"),
        ("unix.sock:80", "unix.sock:80"),
    ] {
        let mut client = Encoder::new();
        let block = encode(&mut client, &request(sent));
        let input = [PREFACE.to_vec(), frame(HEADERS, END_HEADERS | END_STREAM, 1, &block)].concat();
        let frames = frames(&filter(&input, usize::MAX).unwrap());
        assert_eq!((frames[0].0, frames[0].1), (HEADERS, END_HEADERS | END_STREAM));
        assert_eq!(
            Decoder::new().decode(&frames[0].3).unwrap(),
            request(served),
            "{sent:?}"
        );
    }
}

#[test]
fn splits_a_long_block_into_continuation_frames() {
    let mut fields = request(SOCKET);
    fields.push((b"x-long".to_vec(), vec![b'a'; 2 * MAX_FRAME_LEN]));
    let block = encode(&mut Encoder::new(), &fields);
    let mut input = PREFACE.to_vec();
    let mut chunks = block.chunks(MAX_FRAME_LEN).peekable();
    let mut kind = HEADERS;
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() { END_HEADERS } else { 0 };
        input.extend(frame(kind, flags, 1, chunk));
        kind = CONTINUATION;
    }
    let frames = frames(&filter(&input, 1000).unwrap());
    let kinds: Vec<_> = frames.iter().map(|f| (f.0, f.1, f.3.len())).collect();
    let total: usize = kinds.iter().map(|k| k.2).sum();
    assert_eq!(
        kinds,
        [
            (HEADERS, 0, MAX_FRAME_LEN),
            (CONTINUATION, 0, MAX_FRAME_LEN),
            (CONTINUATION, END_HEADERS, total - 2 * MAX_FRAME_LEN)
        ]
    );
    let block: Vec<u8> = frames.iter().flat_map(|f| f.3.clone()).collect();
    fields[3].1 = LOCALHOST.to_vec();
    assert_eq!(Decoder::new().decode(&block).unwrap(), fields);
}

#[test]
fn refuses_what_h2_would_refuse() {
    let block = encode(&mut Encoder::new(), &request(SOCKET));
    let cases = [
        (frame(CONTINUATION, END_HEADERS, 1, &block), FilterError::Interrupted(1)),
        (
            [frame(HEADERS, 0, 1, &block), frame(DATA, 0, 1, b"")].concat(),
            FilterError::Interrupted(1),
        ),
        (
            [frame(HEADERS, 0, 1, &block), frame(CONTINUATION, END_HEADERS, 3, b"")].concat(),
            FilterError::Interrupted(1),
        ),
        (
            [frame(HEADERS, 0, 1, &block), frame(HEADERS, END_HEADERS, 3, &block)].concat(),
            FilterError::Interrupted(1),
        ),
        (
            frame(HEADERS, END_HEADERS, 1, &vec![0; MAX_FRAME_LEN + 1]),
            FilterError::FrameTooLong(MAX_FRAME_LEN + 1),
        ),
        (
            frame(HEADERS, END_HEADERS | PADDED, 5, &[9, 0, 0]),
            FilterError::Malformed(5),
        ),
        (
            frame(HEADERS, END_HEADERS | PRIORITY, 5, &[0, 0]),
            FilterError::Malformed(5),
        ),
        (
            frame(HEADERS, END_HEADERS, 7, &[0xff, 0x7f]),
            FilterError::Hpack {
                stream: 7,
                error: loona_hpack::decoder::DecoderError::HeaderIndexOutOfBounds,
            },
        ),
    ];
    for (frames, error) in cases {
        let input = [PREFACE.to_vec(), frames].concat();
        assert_eq!(filter(&input, usize::MAX), Err(error));
    }
}

#[test]
fn refuses_a_block_longer_than_the_limit() {
    let mut input = [PREFACE.to_vec(), frame(HEADERS, 0, 1, &[0x82])].concat();
    let piece = vec![0x82; MAX_FRAME_LEN];
    for _ in 0..MAX_BLOCK_LEN / MAX_FRAME_LEN {
        input.extend(frame(CONTINUATION, 0, 1, &piece));
    }
    assert_eq!(filter(&input, usize::MAX), Err(FilterError::BlockTooLong));
}

#[test]
fn passes_other_frames_through_as_they_arrive() {
    let data = frame(DATA, 0, 1, &[7; 100]);
    let input = [PREFACE.to_vec(), data.clone()].concat();
    let mut filter = AuthorityFilter::new(String::new());
    let mut out = BytesMut::new();
    filter
        .push(&input[..PREFACE_LEN + FRAME_HEADER_LEN + 10], &mut out)
        .unwrap();
    assert_eq!(
        out.len(),
        PREFACE_LEN + FRAME_HEADER_LEN + 10,
        "a DATA payload is not held back"
    );
    filter
        .push(&input[PREFACE_LEN + FRAME_HEADER_LEN + 10..], &mut out)
        .unwrap();
    assert_eq!(out.to_vec(), input);
}
