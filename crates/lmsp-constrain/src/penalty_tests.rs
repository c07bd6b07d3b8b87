use super::*;

fn recent(penalties: Penalties, tokens: &[TokenId]) -> Recent {
    let mut r = Recent::new(penalties);
    for &t in tokens {
        r.accept(t);
    }
    r
}

#[test]
fn penalties_follow_llama_cpps_formula() {
    let p = Penalties { last_n: 64, repeat: 2.0, frequency: 0.5, presence: 0.25 };
    let mut row = [4.0, -4.0, 4.0, 1.0];
    // Token 0 seen twice, token 1 once, token 2 never; 9 is past the row's end.
    recent(p, &[0, 1, 0, 9]).penalize(&mut row);
    assert_eq!(row, [4.0 / 2.0 - 2.0 * 0.5 - 0.25, -4.0 * 2.0 - 0.5 - 0.25, 4.0, 1.0]);
}

#[test]
fn a_zero_logit_is_multiplied_as_llama_cpp_does() {
    let p = Penalties { repeat: 1.5, ..Penalties::default() };
    let mut row = [0.0, 3.0];
    recent(p, &[0, 1]).penalize(&mut row);
    assert_eq!(row, [0.0, 2.0]);
}

#[test]
fn the_window_keeps_the_last_n_tokens() {
    let p = Penalties { last_n: 2, repeat: 1.0, frequency: 1.0, presence: 0.0 };
    let mut row = [0.0; 3];
    // Token 0 left the window; 1 and 2 are in it once each.
    recent(p, &[0, 0, 1, 2]).penalize(&mut row);
    assert_eq!(row, [0.0, -1.0, -1.0]);
}

#[test]
fn off_settings_change_nothing() {
    for p in [Penalties::default(), Penalties { last_n: 0, repeat: 2.0, frequency: 1.0, presence: 1.0 }] {
        let mut row = [1.0, -1.0];
        let mut r = recent(p, &[0, 1]);
        assert!(r.is_off());
        r.penalize(&mut row);
        assert_eq!(row, [1.0, -1.0]);
    }
}
